"""The gate's protocol, below both its host half and its device side: the control page's layout
(`layout`, the one source of its offsets and codes), the host's loads and stores on it (`page`),
sequence numbers that wrap (`seq`) and the rule of which all-reduces take the gate (`accept`).
Nothing here imports the host half or the device side."""
