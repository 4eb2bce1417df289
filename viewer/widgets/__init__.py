"""Small widgets several windows and panels share: banners, progress bars, plot axes."""
