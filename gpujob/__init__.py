"""gpujob: run GPU training jobs inside Proxmox LXC containers from a laptop."""

__version__ = "0.1.0"
