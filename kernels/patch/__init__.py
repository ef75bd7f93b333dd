"""Catalog kernels in user code: the profile file ``kernelfleet pull`` writes (``profile_file``) and
its in-memory view (``profile_view``), the per-call choice of config (``runtime``), and
:func:`kernelfleet.patch` (``model_patch``, with the patterns it matches in ``model_patterns`` and
``model_quant``). ``model_shapes`` / ``model_linears``: a model's ``config.json`` to the kernel calls
it makes."""
