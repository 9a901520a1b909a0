def pytest_configure(config):
    config.addinivalue_line("markers", "slow: builds and starts the container images (MODELGRID_IMAGE_TESTS=1)")
