"""zmlx's own kernels as a catalog source (``family``: the ``zmlx_*`` specs) and the capture of the
launches zmlx's functions make (``capture``). zmlx's model patching, pinned to a profile, is
:mod:`kernelfleet.zmlx`."""
