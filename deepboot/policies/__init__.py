"""Pure decision functions over ClusterState snapshots, and their registry."""
