"""The entry layer: the `dsv4deploy` command, its verbs, and what the inventories decide while they load.
Only this layer reads argv and the environment."""
