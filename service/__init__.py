"""KernelFleet coordinator: settings, storage, leasing, auth and the HTTP API."""
