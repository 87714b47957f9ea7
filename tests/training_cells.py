"""Training code as users paste it into a cell, shared by the tests that run it in ranks (a kernel's
and a browser's): a tiny Lightning module on synthetic data, 8 batches an epoch."""

LIGHTNING = """
import os, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
"""
