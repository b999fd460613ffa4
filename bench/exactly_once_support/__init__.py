"""Helpers of bench/exactly_once.py: the sinks' writes (:mod:`.effects`), the record processor (:mod:`.processor`)."""
