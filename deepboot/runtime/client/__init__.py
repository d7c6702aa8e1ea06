"""What the CLI commands use: the endpoint's client, the status document, replay, job
and service files, and load generation (rate profiles, trace replay). No module here
imports ray or aiohttp when it is imported (``tests/test_layers.py``)."""
