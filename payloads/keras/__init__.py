"""Keras payload: model.fit with hvd.DistributedOptimizer and Horovod's callbacks (Keras 2, TensorFlow 2.15)."""
