"""The KernelSpec contract: everything the tuner needs to know about one catalog kernel.

Importable with only ``mlx`` and ``numpy`` (no pydantic, FastAPI or SQLAlchemy), so it runs on a
bare GPU host.
"""
