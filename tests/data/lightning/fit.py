# a tiny LightningModule on the CPU, TQDM bar, a checkpoint every 100 steps
import sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

class Rand(Dataset):
    def __len__(self):
        return 1_000_000
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randn(1, generator=g)

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        if SLOW:
            time.sleep(SLOW)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

steps, ckpt, SLOW = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None), \
    (float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
torch.set_num_threads(1)
tr = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, default_root_dir="out",
               callbacks=[TQDMProgressBar(), ModelCheckpoint(dirpath="out/ckpt", every_n_train_steps=100,
                                                              save_top_k=-1)],
               enable_model_summary=False)
tr.fit(M(), DataLoader(Rand(), batch_size=32, num_workers=0), ckpt_path=ckpt)
