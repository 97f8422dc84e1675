"""oracle: the shadow model of what must survive a crash, and its checks."""
