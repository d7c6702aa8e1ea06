"""The controller: the loop's thread. It never awaits and never imports ``http/``.

What a decision needs, and what carries it out on the cluster: the wiring
(:mod:`~deepboot.runtime.controller.wiring`), the state the parts share
(:mod:`~deepboot.runtime.controller.shared`), the world adapter the driver steps
(:mod:`~deepboot.runtime.controller.adapter`), the jobs' records
(:mod:`~deepboot.runtime.controller.jobrecords`), and one module per part:
generations, worker polling, replicas, nodes, intake, recovery, warm-up, watchdog.
"""
