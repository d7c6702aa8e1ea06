"""The cluster the runtime runs on: a local Ray cluster started and stopped with its
controller (``deepboot up``/``down``), or one someone else started, attached to."""
