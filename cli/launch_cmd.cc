// placeholder until the launcher lands
