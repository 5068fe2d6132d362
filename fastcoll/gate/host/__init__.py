"""The gate's host half, shared by every GPU: the Gate the core calls (`gate`), the handshake on
the service thread (`serve`), the direct mode's watcher (`direct_mode`), the arrival poll
(`poll`), the profile (`profile`), what it needs of a device (`device_backend`), the one place that
opens the device side (`backends`) and `probe(config)`, a working Gate or None."""
