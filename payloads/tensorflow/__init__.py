"""TensorFlow 2 payload (custom loop with hvd.DistributedGradientTape) and what the Keras payload shares."""
