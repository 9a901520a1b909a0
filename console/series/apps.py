from django.apps import AppConfig


class SeriesConfig(AppConfig):
    name = "console.series"
    label = "series"
