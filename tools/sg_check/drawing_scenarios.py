"""SG's visualisation callbacks, run by SG's trainer on the TrainLoop: each draws a batch with SG's own drawing helpers
(copied from the wheel with their imports rewritten, as the callback modules are) and writes the images into
``context.sg_logger``, the adapter's logger over the loop.

SG's unit tests assert nothing about these classes, so each scenario checks what the class is for: the images it
logs, under its tag and at its epochs, are SG's drawing of the batch the class is meant to pick (the configured
validation batch, or the batch of highest or lowest loss) with the model's outputs on it. The expected images are
drawn here by SG's helpers from that batch and from the trained model's outputs, computed again after the fit (the
last epoch's validation ran with the final weights); so a wrong batch, a wrong epoch, outputs of another pass or a
missing colour conversion would each show.

Mixed into :class:`~tools.sg_check.scenarios.Scenarios`, which provides ``train``, ``attempt``, ``cb`` (SG's
rewritten callbacks module) and ``adapter``.
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from .fixtures import Net
from ..published_wheel import Watch


# ---- what the scenarios train: small models of each task, and their batches ----------------------------------------

def fresh(batch: Any) -> Any:
    """A copy of ``batch`` with new tensors (tuples, lists and dicts kept)."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, (tuple, list)):
        return type(batch)(fresh(item) for item in batch)
    if isinstance(batch, dict):
        return {key: fresh(item) for key, item in batch.items()}
    return batch


class Batches(list):
    """A loader over fixed batches that, like a DataLoader, gives new tensors on every pass: SG's drawing helpers
    scale the inputs they are given in place."""

    def __iter__(self) -> Any:
        for batch in list.__iter__(self):
            yield fresh(batch)


class BoxNet(Net):
    """A "detector": two boxes per image, ``(x1, y1, x2, y2, confidence, class score)`` in [0, 1], as the first
    element of a tuple (SG's detection models return tuples)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 2 * 6)

    def forward(self, x: torch.Tensor) -> Any:
        return (torch.sigmoid(self.fc(x.flatten(1))).view(-1, 2, 6),)

    def get_loss(self, batch_data: Any, criterion: Any, device: Any) -> torch.Tensor:
        boxes = self(batch_data[0].to(device))[0]
        return criterion(boxes[..., :4], torch.full_like(boxes[..., :4], 0.5))


class MaskNet(Net):
    """A binary segmenter: one logit per pixel, ``(B, 1, H, W)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Conv2d(3, 1, 1)

    def forward(self, x: torch.Tensor) -> Any:
        return self.fc(x)

    def get_loss(self, batch_data: Any, criterion: Any, device: Any) -> torch.Tensor:
        return criterion(self(batch_data[0].to(device))[:, 0], batch_data[1].to(device).float())


class KeypointNet(Net):
    """A pose estimator: ``(B, J, 3)`` keypoints (x, y in [0, 1], a confidence)."""

    def __init__(self, joints: int = 3) -> None:
        super().__init__()
        self.joints = joints
        self.fc = nn.Linear(3 * 8 * 8, joints * 3)

    def forward(self, x: torch.Tensor) -> Any:
        return torch.sigmoid(self.fc(x.flatten(1))).view(-1, self.joints, 3)

    def get_loss(self, batch_data: Any, criterion: Any, device: Any) -> torch.Tensor:
        return criterion(self(batch_data[0].to(device)), batch_data[1].to(device))


class HeatmapNet(Net):
    """DEKR's outputs: keypoint heatmaps ``(B, K, H, W)`` and offsets ``(B, 2K, H, W)``."""

    def __init__(self, keypoints: int = 2) -> None:
        super().__init__()
        self.heatmap = nn.Conv2d(3, keypoints, 1)
        self.offsets = nn.Conv2d(3, 2 * keypoints, 1)

    def forward(self, x: torch.Tensor) -> Any:
        return torch.sigmoid(self.heatmap(x)), self.offsets(x)

    def get_loss(self, batch_data: Any, criterion: Any, device: Any) -> torch.Tensor:
        heatmap, _ = self(batch_data[0].to(device))
        return criterion(heatmap, batch_data[1][0].to(device))


@dataclass
class PoseSample:
    """SG's ``PoseEstimationSample`` as its pose visualisation reads it."""
    joints: np.ndarray          # (poses, joints, 3) in pixels
    bboxes_xywh: np.ndarray     # (poses, 4)
    is_crowd: np.ndarray        # (poses,)


@dataclass
class PosePrediction:
    """SG's ``PoseEstimationPredictions`` as its pose visualisation reads it."""
    poses: np.ndarray           # (poses, joints, 3) in pixels
    bboxes_xyxy: np.ndarray     # (poses, 4)
    scores: np.ndarray          # (poses,)


def pose_predictions(keypoints: Any, device: Any = None) -> List[PosePrediction]:
    """A pose model's post-prediction step: one pose per image, its keypoints scaled to the 8x8 image."""
    predictions = []
    for points in keypoints.detach().cpu().numpy():
        pixels = np.concatenate([points[:, :2] * 8, points[:, 2:]], axis=1)
        low, high = pixels[:, :2].min(0), pixels[:, :2].max(0)
        predictions.append(PosePrediction(pixels[None], np.concatenate([low, high])[None], points[:, 2].mean()[None]))
    return predictions


def detection_targets(generator: torch.Generator, images: int) -> torch.Tensor:
    """SG's detection targets: one box per image, ``(image index, class, cx, cy, w, h)`` scaled to [0, 1]."""
    boxes = torch.rand(images, 4, generator=generator) * 0.3 + torch.tensor([0.3, 0.3, 0.2, 0.2])
    classes = torch.randint(0, 2, (images, 1), generator=generator).float()
    return torch.cat([torch.arange(images, dtype=torch.float32)[:, None], classes, boxes], 1)


def to_rgb(cv2: Any, images: List[np.ndarray]) -> np.ndarray:
    """SG's callbacks turn its BGR drawings into RGB before logging them."""
    return np.stack([cv2.cvtColor(image, cv2.COLOR_BGR2RGB) for image in images])


class DrawingScenarios:
    """The scenarios of SG's visualisation callbacks (a mixin of :class:`~tools.sg_check.scenarios.Scenarios`)."""

    sg: Any
    cb: Any
    adapter: Any
    train: Callable[..., Any]
    attempt: Callable[..., None]
    lr_params: Callable[..., Dict[str, Any]]

    def image_recorder(self) -> Any:
        """An SG callback recording every ``context.sg_logger.add_images`` call of the run: ``(tag, step, images)``."""
        class RecordImages(self.adapter.Callback):
            def __init__(self) -> None:
                self.logged: List[Tuple[str, Any, np.ndarray]] = []

            def on_training_start(self, context: Any) -> None:
                sg_logger, add_images = context.sg_logger, context.sg_logger.add_images
                logged = self.logged

                def recording(tag: str, images: Any, data_format: str = 'NCHW', global_step: Any = None) -> None:
                    logged.append((tag, global_step, np.array(images, copy=True)))
                    add_images(tag, images, data_format=data_format, global_step=global_step)
                sg_logger.add_images = recording
        return RecordImages()

    @staticmethod
    def check_logged(recorder: Any, tag: str, steps: List[int], expected_last: np.ndarray) -> None:
        """The images of ``tag`` were logged at ``steps``, the last ones equal to ``expected_last``."""
        logged = [(step, images) for name, step, images in recorder.logged if name == tag]
        if [step for step, _ in logged] != steps:
            raise AssertionError(f'{tag} logged at steps {[step for step, _ in logged]}, expected {steps} '
                                 f'(all tags: {sorted({name for name, _, _ in recorder.logged})})')
        last = logged[-1][1]
        if last.shape != expected_last.shape or not np.array_equal(last, expected_last):
            raise AssertionError(f'{tag}: the last images logged ({last.shape}) are not SG\'s drawing of the batch '
                                 f'expected ({expected_last.shape})')

    @staticmethod
    def final_outputs(run: Any, inputs: torch.Tensor) -> Any:
        model = run.loop.model.eval()
        with torch.no_grad():
            return model(inputs)

    @staticmethod
    def batch_losses(run: Any, batches: List[Any]) -> List[float]:
        """Each validation batch's loss with the trained model (the last epoch's validation losses)."""
        loop = run.loop
        loop.model.eval()
        with torch.no_grad():
            return [float(loop.model.get_loss(batch, loop.criterion, loop.device)) for batch in batches]

    # ---- BinarySegmentationVisualizationCallback ---------------------------------------------------------------

    def scenario_binary_segmentation_visualization(self) -> None:
        def body(watch: Watch) -> None:
            g = torch.Generator().manual_seed(3)
            batches = Batches((torch.randn(3, 3, 8, 8, generator=g), (torch.rand(3, 8, 8, generator=g) > 0.5).long())
                              for _ in range(2))
            recorder = self.image_recorder()
            callback = self.cb.BinarySegmentationVisualizationCallback(self.adapter.Phase.VALIDATION_BATCH_END,
                                                                       freq=2, batch_idx=1)
            run = self.train(watch, self.lr_params(max_epochs=3, phase_callbacks=[callback, recorder]), batches,
                             batches, criterion=nn.BCEWithLogitsLoss(), model=MaskNet())
            inputs, masks = batches[1]
            drawn = self.cb.BinarySegmentationVisualization.visualize_batch(
                inputs.clone(), self.final_outputs(run, inputs), masks, 1)
            # every second epoch (0 and 2), validation batch 1, the last image left out as SG's slice [:-1] does
            self.check_logged(recorder, 'batch_1_images', [0, 2], to_rgb(self.cb.cv2, drawn)[:-1])
        self.attempt(['BinarySegmentationVisualizationCallback'], [], body)

    # ---- DetectionVisualizationCallback ------------------------------------------------------------------------

    def post_prediction(self) -> Any:
        """A detection model's post-prediction step on SG's base class: per image, its boxes in pixels of the 8x8
        image as ``(x1, y1, x2, y2, confidence, class)``."""
        class PixelBoxes(self.cb.DetectionPostPredictionCallback):
            def forward(self, x: Any, device: Optional[str] = None) -> List[torch.Tensor]:
                boxes = x[0]
                corners = boxes[..., :4] * 8
                low = torch.minimum(corners[..., :2], corners[..., 2:])
                high = torch.maximum(corners[..., :2], corners[..., 2:])
                return list(torch.cat([low, high, boxes[..., 4:5], (boxes[..., 5:6] > 0.5).float()], -1))
        return PixelBoxes()

    def detection_batches(self, seed: int) -> 'Batches':
        g = torch.Generator().manual_seed(seed)
        return Batches((torch.rand(3, 3, 8, 8, generator=g), detection_targets(g, 3)) for _ in range(3))

    def scenario_detection_visualization(self) -> None:
        def body(watch: Watch) -> None:
            batches = self.detection_batches(4)
            recorder = self.image_recorder()
            post_prediction = self.post_prediction()
            callback = self.cb.DetectionVisualizationCallback(
                self.adapter.Phase.VALIDATION_BATCH_END, freq=1, post_prediction_callback=post_prediction,
                classes=['cat', 'dog'], batch_idx=2)
            run = self.train(watch, self.lr_params(max_epochs=2, phase_callbacks=[callback, recorder]), batches,
                             batches, criterion=nn.MSELoss(), model=BoxNet())
            inputs, targets = batches[2]
            outputs = self.final_outputs(run, inputs)
            drawn = self.cb.DetectionVisualization.visualize_batch(
                inputs.clone(), post_prediction((outputs[0].clone(), None)), targets, 2, ['cat', 'dog'])
            self.check_logged(recorder, 'batch_2_images', [0, 1], to_rgb(self.cb.cv2, drawn)[:-1])
        self.attempt(['DetectionVisualizationCallback'], [], body)

    # ---- ExtremeBatchDetectionVisualizationCallback ------------------------------------------------------------

    def scenario_extreme_batch_detection(self) -> None:
        def body(watch: Watch) -> None:
            batches = self.detection_batches(5)
            recorder = self.image_recorder()
            post_prediction = self.post_prediction()
            extreme = self.cb.ExtremeBatchDetectionVisualizationCallback
            callback = extreme(post_prediction_callback=post_prediction, loss_to_monitor='MSELoss', max=True,
                               classes=['cat', 'dog'])
            run = self.train(watch, self.lr_params(max_epochs=2, phase_callbacks=[callback, recorder]), batches,
                             batches, criterion=nn.MSELoss(), model=BoxNet())
            inputs, targets = batches[int(np.argmax(self.batch_losses(run, batches)))]
            outputs = self.final_outputs(run, inputs)
            visualize = self.cb.DetectionVisualization.visualize_batch
            undo = extreme.universal_undo_preprocessing_fn
            predicted = visualize(inputs.clone(), post_prediction(outputs), targets.clone(), 'extreme_batch_preds',
                                  ['cat', 'dog'], gt_alpha=0.0, undo_preprocessing_func=undo)
            truth = visualize(inputs.clone(), None, targets.clone(), 'extreme_batch_gt', ['cat', 'dog'],
                              gt_alpha=1.0, undo_preprocessing_func=undo)
            # the ground truth and the predictions side by side, of the validation batch of highest loss
            expected = np.concatenate([np.stack(truth), np.stack(predicted)], axis=2)
            self.check_logged(recorder, 'valid/max_MSELoss_batch', [0, 1], expected)
        self.attempt(['ExtremeBatchDetectionVisualizationCallback'], [], body)

    # ---- ExtremeBatchPoseEstimationVisualizationCallback -------------------------------------------------------

    def scenario_extreme_batch_pose_estimation(self) -> None:
        def body(watch: Watch) -> None:
            g = torch.Generator().manual_seed(6)
            batches = Batches()
            for _ in range(3):
                keypoints = torch.rand(2, 3, 3, generator=g)
                samples = [PoseSample(np.concatenate([points[:, :2] * 8, np.ones((3, 1))], 1)[None],
                                      np.array([[1.0, 1.0, 5.0, 5.0]]), np.array([False]))
                           for points in keypoints.numpy()]
                # SG's batch format: (inputs, targets, {name: item}); the callback reads 'gt_samples'
                batches.append((torch.rand(2, 3, 8, 8, generator=g), keypoints, {'gt_samples': samples}))
            recorder = self.image_recorder()
            module = self.sg.extreme_batch_pose_visualization_callback
            extreme = module.ExtremeBatchPoseEstimationVisualizationCallback
            skeleton = {'keypoint_colors': [(255, 0, 0), (0, 255, 0), (0, 0, 255)],
                        'edge_colors': [(255, 255, 0), (0, 255, 255)], 'edge_links': [(0, 1), (1, 2)]}
            # max_images given, as SG's documented recipe does: its default (None) fails SG's own `> 0` test
            callback = extreme(post_prediction_callback=pose_predictions, loss_to_monitor='MSELoss', max=False,
                               max_images=16, **skeleton)
            run = self.train(watch, self.lr_params(max_epochs=2, phase_callbacks=[callback, recorder]), batches,
                             batches, criterion=nn.MSELoss(), model=KeypointNet())
            inputs, _, items = batches[int(np.argmin(self.batch_losses(run, batches)))]
            images = extreme.universal_undo_preprocessing_fn(inputs.clone())
            predictions = pose_predictions(self.final_outputs(run, inputs))
            predicted = extreme._visualize_batch(
                image_tensor=images, keypoints=[p.poses for p in predictions],
                bboxes=[p.bboxes_xyxy for p in predictions], scores=[p.scores for p in predictions], is_crowd=None,
                show_keypoint_confidence=True, **skeleton)
            xywh_to_xyxy = module.xywh_to_xyxy
            samples = items['gt_samples']
            truth = extreme._visualize_batch(
                image_tensor=images, keypoints=[s.joints for s in samples],
                bboxes=[xywh_to_xyxy(s.bboxes_xywh, image_shape=None) for s in samples], scores=None,
                is_crowd=[s.is_crowd for s in samples], show_keypoint_confidence=False, **skeleton)
            expected = np.concatenate([np.stack(truth), np.stack(predicted)], axis=2)
            self.check_logged(recorder, 'valid/min_MSELoss_batch', [0, 1], expected)
        self.attempt(['ExtremeBatchPoseEstimationVisualizationCallback'], [], body)

    # ---- DEKRVisualizationCallback -----------------------------------------------------------------------------

    def scenario_dekr_visualization(self) -> None:
        def body(watch: Watch) -> None:
            g = torch.Generator().manual_seed(7)
            batches = Batches()
            for _ in range(2):
                heatmap = torch.rand(2, 2, 16, 16, generator=g)
                mask = (torch.rand(2, 2, 16, 16, generator=g) > 0.2).float()
                # DEKR's targets: heatmaps, their mask, offsets and offset weights
                batches.append((torch.randn(2, 3, 16, 16, generator=g),
                                (heatmap, mask, torch.zeros(2, 4, 16, 16), torch.ones(2, 4, 16, 16))))
            recorder = self.image_recorder()
            dekr = self.sg.dekr_visualization_callbacks.DEKRVisualizationCallback
            callback = dekr(self.adapter.Phase.VALIDATION_BATCH_END, prefix='dekr_', mean=[0.5, 0.5, 0.5],
                            std=[0.25, 0.25, 0.25], batch_idx=1)
            run = self.train(watch, self.lr_params(max_epochs=2, phase_callbacks=[callback, recorder]), batches,
                             batches, criterion=nn.MSELoss(), model=HeatmapNet())
            inputs, targets = batches[1]
            expected = np.stack(callback.visualize_batch(inputs, self.final_outputs(run, inputs), targets))
            self.check_logged(recorder, 'dekr_1_images', [0, 1], expected)
        self.attempt(['DEKRVisualizationCallback'], [], body)
