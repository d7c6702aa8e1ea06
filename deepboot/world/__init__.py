"""What both worlds share below them: the simulator (:mod:`deepboot.sim`) and the
runtime (:mod:`deepboot.runtime`) are two worlds the control loop
(:mod:`deepboot.scheduler.control`) drives, and this layer is what they have in
common, so that they cannot drift apart:

* :mod:`~deepboot.world.queue`: the event queue (time, then kind, then order pushed);
* :mod:`~deepboot.world.gpus`: the GPU ledger, through which every GPU change goes
  (``check_transition``), with its per-state GPU-second accounting;
* :mod:`~deepboot.world.demand`: each service's demand as the lending reserve and the
  SLO guard read it (arrivals and run times, from the past only);
* :mod:`~deepboot.world.settings`: the shared-cluster configuration, typed, parsed
  once and turned into the loop's settings by one function.

It imports ``core``, ``perf``, ``policies`` and ``scheduler``; nothing below imports it.
"""
