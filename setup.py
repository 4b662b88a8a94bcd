"""Packaging hook: the repository's conf/ and sample app ship inside the wheel as sp_dagster/_defaults (one copy in git)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DEFAULTS = {"conf": "conf", "apps/stock-alerts.siddhi": "apps/stock-alerts.siddhi"}


class BuildWithDefaults(build_py):
    """build_py, then copy the packaged defaults next to the modules."""

    def run(self):
        """Build the modules and add sp_dagster/_defaults."""
        super().run()
        target = Path(self.build_lib) / "sp_dagster" / "_defaults"
        for source, name in DEFAULTS.items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            if Path(source).is_dir():
                shutil.copytree(source, target / name, dirs_exist_ok=True)
            else:
                shutil.copyfile(source, target / name)


setup(cmdclass={"build_py": BuildWithDefaults})
