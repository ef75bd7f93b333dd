"""KernelFleet's user-facing entry points (``kernelfleet.zmlx.patch``); the service, worker, web and
kernel packages live beside this one as ``kernelfleet.service`` and so on."""
