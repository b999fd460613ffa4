"""The two processors bench/multilang.py compares: the same work in-process and as a MultiLang child."""
