"""What the runtime keeps on disk: the SQLite job store and its schema, the state
directory, its one-holder lock, and the ownership checks on every path in it."""
