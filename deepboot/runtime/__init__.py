"""The distributed runtime (Ray backend, elastic training library). Not built yet."""
