"""Rendering and compiling: the kernel dialect (``dialect``) spelled for Metal (``metal``) and CUDA
(``cuda``), launched through ``mx.fast`` (``launch``); on CUDA, compiled ahead of the first launch in
a pool of NVRTC processes (``nvrtc``, ``cuda_precompile``)."""
