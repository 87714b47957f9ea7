"""What ranks report, read back by the kernel: text in the order it was written (``_streams``) and
display records turned into items every view can draw (``_display``)."""
