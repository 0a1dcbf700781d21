"""Past one device: tensor parallel (sharding.py, tensor_parallel.py), expert parallel (experts.py),
both built by model.py; data-parallel replicas behind a router (replicas.py, router.py). The
collectives are torch.distributed's (comm.py), between worker processes (workers.py).
See docs/parallel.md."""
