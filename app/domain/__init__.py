"""What users do: chats, compare, the blind arena, prompt-set grids, per-tab sessions."""
