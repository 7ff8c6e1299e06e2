from .abstract import AbstractCallback, AbstractExperimentCallback, StopTraining, TrainingInterrupted
