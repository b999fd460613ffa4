"""How many workers the fleet needs (docs/autoscaling.md): pure sizing rules the leader applies each full cycle."""
