"""Root pytest configuration: run the notebooks in notebooks/ (nbmake) whenever nbmake is installed,
so the README's plain `pytest` executes them top to bottom as tests."""


def pytest_configure(config):
    if config.pluginmanager.hasplugin("nbmake") and hasattr(config.option, "nbmake"):
        config.option.nbmake = True
