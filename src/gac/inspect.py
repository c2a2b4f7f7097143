"""`gac inspect`: every compressible dim of a model and whether it is aligned (listing in gac.models.dims, plot in
gac.evaluate.dims_plot; this module is the verb's public face)."""

from gac.evaluate.dims_plot import plot_dims
from gac.models.dims import Dim, InspectResult, inspect_model

__all__ = ["Dim", "InspectResult", "inspect_model", "plot_dims"]
