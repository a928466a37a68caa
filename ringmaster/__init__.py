"""Ringmaster: elastic training for PyTorch with Horovod's API and torchrun's environment.

Training scripts import the user API: `import ringmaster.torch as hvd`. The rest of the
namespace is the service itself; README.md's layout section says where each part lives in
the repository (the folders are mapped under this namespace when installed).
"""

__version__ = "0.1.0"
