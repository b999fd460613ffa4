"""Lambda handlers (thin: they parse the event and call worker_lib)."""
