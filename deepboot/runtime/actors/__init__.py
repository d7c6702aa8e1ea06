"""Ray actors and their handles: elastic workers and inference replicas as Ray runs
them, the node-local model cache, and the Ray resources that name GPUs and pools."""
