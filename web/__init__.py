"""The KernelFleet dashboard: server-rendered pages (Jinja2) with Plotly figures built from SQL
aggregates. ``kernelfleet.web.router.router`` is included by the coordinator app."""
