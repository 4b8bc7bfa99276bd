"""The torch interop: DeviceMesh in and out, the init_device_mesh drop-in, DTensor."""
