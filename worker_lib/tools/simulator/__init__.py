"""``shardlease simulate``'s engine: ``model`` (the fleet, events and the simulation), ``measures`` (imbalance,
the LPT reference, bounds on moves, convergence), ``render`` (text tables) and ``plot`` (PNG, extra ``plot``)."""
