"""HTTP routers, one module per resource; each exposes ``router``."""
