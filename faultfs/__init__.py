"""faultfs: a crash-counter I/O shim with a page-cache model."""
