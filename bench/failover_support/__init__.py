"""Helpers of ``bench/failover.py``: the journal processor and the Lambda schedule runner (both run in child
processes), the fleet (emulators, producer, worker and leader processes), the journal reader and the report."""
