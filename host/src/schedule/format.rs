//! Schedule file formats: JSON (canonical), CSV (PyTorch pipelining compute-only), text grid (to be written).
