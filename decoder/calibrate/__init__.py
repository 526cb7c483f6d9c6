"""Calibration: ``python -m decoder.calibrate`` measures a bundle's draft length g* and tree budget
on this device (``run``) into its ``calibration.json`` (``file``, which the decoder reads);
``costs`` measures the device's cost curve (also ``python -m decoder.calibrate.costs``)."""
