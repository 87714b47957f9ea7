"""How a run is shown: the live widget (``_widget``) frozen into a static bundle (``_bundle``) at
the end, ``[rank{r}]:`` text lines (``_text``), the bounded tail both keep (``_tail``), the
JupyterLab toolbar's status comm (``_status``), and a kernel kept Busy while a run goes (``_busy``)."""
