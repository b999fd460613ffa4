"""The processor bench/fanout.py runs in its worker processes."""
