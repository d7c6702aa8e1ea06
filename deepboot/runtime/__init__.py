"""The distributed runtime: a Ray cluster, the controller, the job store.

The controller drives the same control loop as the simulator (``scheduler.control``)
in real time; workers are Ray actors running ``deepboot.elastic``. Needs the
``runtime`` extra (ray, torch). See docs/runtime.md.
"""
