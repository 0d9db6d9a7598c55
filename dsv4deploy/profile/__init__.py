"""The profile model: loading with positions, the schema, semantic validation, the GPU-memory budget
and the boundary rule every string passes. Pure: nothing here touches a host."""
