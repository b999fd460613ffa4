"""The leader Lambda: ``functions.leader.handler.handler``."""
