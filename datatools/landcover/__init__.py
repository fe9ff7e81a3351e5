"""Land-cover data on a workstation: rasters cut into training blocks (prepare), synthetic tiles (synthetic)."""
