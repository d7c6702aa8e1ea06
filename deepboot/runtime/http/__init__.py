"""The HTTP endpoint: the router's event loop (aiohttp, in a thread of the controller's
process). It never touches the GPU ledger: it tells the controller what happened
through :mod:`deepboot.runtime.messages` and is told through the port protocol there.

The server and the requests waiting for replicas (:mod:`~deepboot.runtime.http.router`),
the checks every request passes (:mod:`~deepboot.runtime.http.frontdoor`), the
replicas' slots (:mod:`~deepboot.runtime.http.dispatch`), the live dashboard and its
sessions, and the connections' bounds.
"""
