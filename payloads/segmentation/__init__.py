"""Land-cover segmentation: a U-Net trained with Horovod on four-band aerial imagery (NAIP) cut into blocks."""
