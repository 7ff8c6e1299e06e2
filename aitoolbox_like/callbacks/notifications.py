"""Email reports of a training through AWS SES: EmailNotification and its SESSender (re-exported by :mod:`.basic`,
AIToolbox's home of them)."""
import html
import logging
import os
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import formataddr
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .abstract import AbstractCallback, AbstractExperimentCallback
from .performance_eval import ModelTrainHistoryFileWriter, ModelTrainHistoryPlot

# The logger keeps the name of the module these callbacks were split from (basic), which logging set-ups name.
logger = logging.getLogger('aitoolbox_like.callbacks.basic')


def _import_boto3(who: str) -> Tuple[Any, Any]:
    try:
        import boto3
        import botocore.config
    except ImportError as exc:
        raise ImportError(f'{who} needs boto3: pip install aitoolbox_like[s3]') from exc
    return boto3, botocore.config


class SESSender:
    """Sends HTML emails with attachments through AWS Simple Email Service (``send_raw_email``).

    Credentials, and optionally an endpoint (``AWS_ENDPOINT_URL_SES``) and retries (``AWS_MAX_ATTEMPTS``,
    ``AWS_RETRY_MODE``), come from the usual boto3 configuration. The boto3 client is created at the first
    send, so the sender can be pickled before training (DDP launch).

    Args:
        sender_name (str): name shown as the sender.
        sender_email (str): sender address (verified in SES).
        recipient_email (str or list of str): recipient address(es).
        aws_region (str): SES region.
    """

    CHARSET = 'UTF-8'
    # Seconds; botocore's defaults (60 s) would hold training up for minutes on an unreachable endpoint.
    connect_timeout_s = 10
    read_timeout_s = 30

    def __init__(self, sender_name: str, sender_email: str, recipient_email: Union[str, Sequence[str]],
                 aws_region: str = 'eu-west-1') -> None:
        _import_boto3('SESSender')
        self.sender_name = sender_name
        self.sender_email = sender_email
        self.recipient_email = recipient_email
        self.aws_region = aws_region
        self._client: Any = None

    @property
    def sender(self) -> str:
        """``Name <address>`` of the sender."""
        return formataddr((self.sender_name, self.sender_email))

    @property
    def recipients(self) -> List[str]:
        """The recipient addresses as a list."""
        return [self.recipient_email] if isinstance(self.recipient_email, str) else list(self.recipient_email)

    @property
    def client(self) -> Any:
        """The boto3 SES client, created at first use."""
        if self._client is None:
            boto3, config = _import_boto3('SESSender')
            self._client = boto3.client('ses', region_name=self.aws_region, config=config.Config(
                connect_timeout=self.connect_timeout_s, read_timeout=self.read_timeout_s))
        return self._client

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state['_client'] = None
        return state

    def build_message(self, subject: str, body: str,
                      attachment_file_paths: Optional[Iterable[str]] = None) -> MIMEMultipart:
        """The MIME message: an HTML part (``body`` inside <html><body>) and one attachment per existing file
        (a missing file is skipped with a warning)."""
        message = MIMEMultipart('mixed')
        message['Subject'] = subject
        message['From'] = self.sender
        message['To'] = ', '.join(self.recipients)
        alternative = MIMEMultipart('alternative')
        html_text = f'<html>\n<head></head>\n<body>\n{body}\n</body>\n</html>\n'
        alternative.attach(MIMEText(html_text, 'html', self.CHARSET))
        message.attach(alternative)
        for path in attachment_file_paths or []:
            try:
                with open(path, 'rb') as f:
                    part = MIMEApplication(f.read())
            except OSError as error:
                logger.warning('Email attachment %s skipped: %s', path, error)
                continue
            part.add_header('Content-Disposition', 'attachment', filename=os.path.basename(path))
            message.attach(part)
        return message

    def send_email(self, subject: str, body: str, attachment_file_paths: Optional[Iterable[str]] = None) -> str:
        """Send the email; returns SES's MessageId. Errors (botocore's) are raised to the caller."""
        message = self.build_message(subject, body, attachment_file_paths)
        response = self.client.send_raw_email(Source=self.sender, Destinations=self.recipients,
                                              RawMessage={'Data': message.as_bytes()})
        return response.get('MessageId', '')


class EmailNotification(AbstractCallback):
    """Email a report after every epoch and at the end of training, through AWS SES (needs boto3:
    ``pip install aitoolbox_like[s3]``).

    The epoch email lists the latest value of every history metric; the end-of-training email also lists the
    hyperparameters of a tracking TrainLoop. Files written by ModelTrainHistoryPlot and
    ModelTrainHistoryFileWriter in the same epoch are attached. A failed send never stops training: the first
    failure is logged as an error with its reason, and the end of training reports how many failed.

    Args:
        sender_name (str): name shown as the sender.
        sender_email (str): sender address (verified in SES).
        recipient_email (str): where the emails go.
        project_name (str or None): for the subject (None: the tracking TrainLoop's, else 'default_project').
        experiment_name (str or None): for the subject (None: the tracking TrainLoop's, else 'experiment').
        aws_region (str): SES region.
    """

    def __init__(self, sender_name: str, sender_email: str, recipient_email: Union[str, Sequence[str]],
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 aws_region: str = 'eu-west-1') -> None:
        super().__init__('Send email to notify about the state of training', execution_order=98,
                         device_idx_execution=0)
        _import_boto3('EmailNotification')       # a missing extra fails here, not after the first epoch
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.ses_sender: Optional[SESSender] = None     # created at registration
        self.sender_name = sender_name
        self.sender_email = sender_email
        self.recipient_email = recipient_email
        self.aws_region = aws_region
        self.sent_count = 0
        self.failed_count = 0

    def on_train_loop_registration(self) -> None:
        """Take the names from the TrainLoop (or the defaults) and create the SES sender."""
        loop = self.train_loop_obj
        # A plain TrainLoop has no names; AIToolbox raised an error, the subject uses the defaults instead.
        if self.project_name is None:
            self.project_name = getattr(loop, 'project_name', None) or AbstractExperimentCallback.DEFAULT_PROJECT_NAME
        if self.experiment_name is None:
            self.experiment_name = getattr(loop, 'experiment_name', None) or AbstractExperimentCallback.DEFAULT_EXPERIMENT_NAME
        self.ses_sender = SESSender(self.sender_name, self.sender_email, self.recipient_email, self.aws_region)

    def on_epoch_end(self) -> None:
        """Send the end-of-epoch report."""
        epoch = self.train_loop_obj.epoch
        subject = f'End of epoch {epoch} report: {self.project_name}: {self.experiment_name}'
        body = f'<h2>End of epoch {epoch}</h2>\n{self.get_metric_list_html()}'
        self._send(subject, body)

    def on_train_end(self) -> None:
        """Send the end-of-training report (or, after an interruption, say so)."""
        interrupted = self.train_loop_obj.interrupted
        what = f'Training interrupted ({interrupted})' if interrupted else 'End of training'
        subject = f'{what}: {self.project_name}: {self.experiment_name}'
        body = (f'<h2>{html.escape(what)} at epoch {self.train_loop_obj.epoch}</h2>\n{self.get_metric_list_html()}\n'
                f'<h3>Used hyper parameters:</h3>\n{self.get_hyperparams_html()}')
        self._send(subject, body)
        if self.failed_count > 1:
            logger.warning('EmailNotification: %d of %d emails could not be sent (the first failure was logged)',
                           self.failed_count, self.failed_count + self.sent_count)

    def get_metric_list_html(self) -> str:
        """HTML list of the latest value of every history metric."""
        items = [f'<li><p>{html.escape(str(name))}: {html.escape(str(values[-1]))}</p></li>'
                 for name, values in self.train_loop_obj.train_history.items() if len(values) > 0]
        return '<ul>' + '\n'.join(items) + '</ul>'

    def get_hyperparams_html(self) -> str:
        """HTML list of the tracking TrainLoop's hyperparameters, or 'Not given'."""
        hyperparams = getattr(self.train_loop_obj, 'hyperparams', None)
        if not isinstance(hyperparams, dict):
            return 'Not given'
        items = [f'<li><p>{html.escape(str(name))}: {html.escape(str(value))}</p></li>'
                 for name, value in hyperparams.items()]
        return '<ul>' + '\n'.join(items) + '</ul>'

    def get_attachment_paths(self) -> List[str]:
        """Files the history plot / file writer callbacks of this loop wrote at their last call."""
        paths: List[str] = []
        for callback in self.train_loop_obj.callbacks:
            if isinstance(callback, (ModelTrainHistoryPlot, ModelTrainHistoryFileWriter)):
                paths += [p for p in callback.last_written_files if os.path.isfile(p) and p not in paths]
        return paths

    def _send(self, subject: str, body: str) -> bool:
        try:
            # Inside the try: a sender missing (never registered) counts as a failed send, as it always did.
            ses_sender = self.ses_sender
            assert ses_sender is not None, 'the SES sender is created at registration'
            message_id = ses_sender.send_email(subject, body, self.get_attachment_paths())
        except Exception as error:      # an email is a report: training goes on whatever went wrong
            self.failed_count += 1
            if self.failed_count == 1:
                logger.error('EmailNotification could not send %r to %s via SES in %s (%s: %s); training goes '
                             'on, later failures are only counted', subject, self.recipient_email, self.aws_region,
                             type(error).__name__, error)
            else:
                logger.debug('EmailNotification failure %d: %s: %s', self.failed_count, type(error).__name__, error)
            return False
        self.sent_count += 1
        logger.info('EmailNotification sent %r (SES MessageId %s)', subject, message_id)
        return True
