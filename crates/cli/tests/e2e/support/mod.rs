//! Harness for the end-to-end tests: a real `mcm apiserver` child process per test, in its own data directory and
//! on its own port, and real `kubectl` against it. Every wait polls with a deadline; the server and any background
//! kubectl are killed and reaped when their guard drops, also when a test panics.

pub mod deploy;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

/// How long the server may take to become ready.
pub const READY_DEADLINE: Duration = Duration::from_secs(20);
/// How long one kubectl command may take before the test fails.
pub const COMMAND_DEADLINE: Duration = Duration::from_mins(1);
/// How long a condition (a watch line, a deletion) may take to show.
pub const CONDITION_DEADLINE: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

/// Polls `probe` until it returns `Some`, or panics with `what` after `deadline`.
pub fn poll<T>(what: &str, deadline: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        thread::sleep(POLL);
    }
}

/// The output so far of a child whose stdout and stderr are read by background threads.
#[derive(Clone, Default)]
struct Captured {
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Captured {
    fn attach(child: &mut Child) -> (Self, Vec<thread::JoinHandle<()>>) {
        fn pump(mut from: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> thread::JoinHandle<()> {
            thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = from.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    into.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            })
        }
        let captured = Self::default();
        let readers = vec![
            pump(
                child.stdout.take().expect("piped stdout"),
                Arc::clone(&captured.stdout),
            ),
            pump(
                child.stderr.take().expect("piped stderr"),
                Arc::clone(&captured.stderr),
            ),
        ];
        (captured, readers)
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }
}

/// A child process (kubectl, `mcm run`) running in the background, killed and reaped on drop.
pub struct Background {
    child: Child,
    captured: Captured,
    readers: Vec<thread::JoinHandle<()>>,
    what: String,
}

impl Background {
    /// Starts `command` with its output captured.
    pub fn spawn(mut command: Command, what: String) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run {what}: {err}"));
        let (captured, readers) = Captured::attach(&mut child);
        Self {
            child,
            captured,
            readers,
            what,
        }
    }

    /// Its standard output so far.
    pub fn stdout(&self) -> String {
        self.captured.stdout()
    }

    /// Its standard error so far.
    pub fn stderr(&self) -> String {
        self.captured.stderr()
    }

    /// Waits until its standard output satisfies `done`; panics with the output after the deadline.
    pub fn wait_for_stdout(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        self.wait_for(what, |c| done(&c.stdout()))
    }

    /// Waits until its standard error satisfies `done` (e.g. a request logged with `-v=6`).
    pub fn wait_for_stderr(&self, what: &str, done: impl Fn(&str) -> bool) {
        self.wait_for(what, |c| done(&c.stderr()));
    }

    fn wait_for(&self, what: &str, done: impl Fn(&Captured) -> bool) -> String {
        let end = Instant::now() + CONDITION_DEADLINE;
        loop {
            let out = self.stdout();
            if done(&self.captured) {
                return out;
            }
            assert!(
                Instant::now() < end,
                "`{}`: timed out waiting for {what}\nstdout:\n{out}\nstderr:\n{}",
                self.what,
                self.captured.stderr()
            );
            thread::sleep(POLL);
        }
    }

    /// Waits for it to exit on its own (panics after `deadline`, killing it) and returns its output.
    pub fn finish(mut self, deadline: Duration) -> Output {
        let end = Instant::now() + deadline;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "`{}` did not finish within {deadline:?}\nstdout:\n{}\nstderr:\n{}",
                    self.what,
                    self.captured.stdout(),
                    self.captured.stderr()
                );
            }
            thread::sleep(POLL);
        };
        self.output(status)
    }

    /// Stops it with SIGTERM (through the `kill` command), waits for it to exit within `deadline` and returns what
    /// it printed: a clean shutdown, unlike [`Background::stop`].
    pub fn terminate(self, deadline: Duration) -> Output {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -TERM {} failed", self.what);
        self.finish(deadline)
    }

    /// Kills it and returns what it printed.
    pub fn stop(mut self) -> Output {
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait");
        self.output(status)
    }

    fn output(&mut self, status: ExitStatus) -> Output {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        Output {
            status,
            stdout: self.captured.stdout.lock().unwrap().clone(),
            stderr: self.captured.stderr.lock().unwrap().clone(),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `mcm apiserver` in a temporary directory of its own.
pub struct Server {
    /// The test's directory: `data/` (the server's), `kubecache/` (kubectl's), `server.log`, and the test's files.
    pub dir: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Server {
    /// Starts a server on a free port (`--port 0`) in a fresh directory named for the test.
    pub fn start(test: &str) -> Self {
        Self::start_with(test, |_| Vec::new())
    }

    /// Starts a server like [`Server::start`] with more arguments, which `prepare` returns after writing the files
    /// they name into the test's directory (e.g. `--token-auth-file`). A [`Server::restart`] does not repeat them.
    pub fn start_with(test: &str, prepare: impl FnOnce(&Path) -> Vec<String>) -> Self {
        let dir = std::env::temp_dir().join(format!("mcm-e2e-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test directory");
        let extra = prepare(&dir);
        let mut server = Self {
            dir,
            child: None,
            starts: 0,
        };
        let mut args = vec!["--port", "0"];
        args.extend(extra.iter().map(String::as_str));
        server.spawn(&args);
        server
    }

    /// Writes `name` into the test's directory: the server's kubeconfig with `token` instead of the admin token (a
    /// user of the server's `--token-auth-file`).
    pub fn kubeconfig_with_token(&self, name: &str, token: &str) -> PathBuf {
        let text = std::fs::read_to_string(self.kubeconfig()).expect("the kubeconfig");
        let mut config: serde_json::Value = serde_saphyr::from_str(&text).expect("the kubeconfig is YAML");
        config["users"][0]["user"]["token"] = serde_json::Value::from(token);
        // JSON is YAML: kubectl and kube read it as a kubeconfig.
        self.write(name, &config.to_string())
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The kubeconfig the server wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir().join("kubeconfig")
    }

    fn spawn(&mut self, extra: &[&str]) {
        self.starts += 1;
        let log =
            std::fs::File::create(self.dir.join(format!("server-{}.log", self.starts))).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_mcm"))
            .arg("apiserver")
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("mcm apiserver starts");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        poll("the server to be ready", READY_DEADLINE, || {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().expect("try_wait")) {
                panic!("mcm apiserver exited early ({status}):\n{}", self.logs());
            }
            (self.kubeconfig().exists() && self.kubectl(&["get", "--raw", "/readyz"]).status.success())
                .then_some(())
        });
    }

    /// Everything the server processes of this test logged.
    pub fn logs(&self) -> String {
        (1..=self.starts)
            .map(|n| std::fs::read_to_string(self.dir.join(format!("server-{n}.log"))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n--- restart ---\n")
    }

    /// Stops the server with SIGTERM (through the `kill` command) and waits for a clean exit.
    pub fn terminate(&mut self) {
        let mut child = self.child.take().expect("the server is running");
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -TERM failed");
        let status = poll("the server to exit after SIGTERM", READY_DEADLINE, || {
            child.try_wait().expect("try_wait")
        });
        assert!(
            status.success(),
            "the server exited with {status} after SIGTERM:\n{}",
            self.logs()
        );
    }

    /// Kills the server with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("the server is running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    /// Pauses the server with SIGSTOP (through the `kill` command): connections are accepted by the kernel, nothing
    /// answers, as with a hung API server. [`Server::resume`] continues it.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Continues a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the server is running");
        let sent = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {signal} failed");
    }

    /// Starts the server again on the same data directory, without `--port` (it must reuse its port).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the server first");
        self.spawn(&[]);
    }

    /// The directory of kubectl's discovery cache (one per test, so parallel tests share nothing).
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.join("kubecache")
    }

    /// Runs kubectl to the end (panicking if it hangs past the command deadline).
    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_at(&self.kubeconfig(), &self.cache_dir(), args)
    }

    /// Runs kubectl, which must succeed; its standard output.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            output.status.success(),
            "kubectl {} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8 output")
    }

    /// Runs kubectl, which must fail; its standard error.
    pub fn kubectl_err(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            !output.status.success(),
            "kubectl {} should have failed:\nstdout:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// Starts kubectl in the background (for `get -w`, `wait`).
    pub fn kubectl_background(&self, args: &[&str]) -> Background {
        Background::spawn(
            kubectl_command(&self.kubeconfig(), &self.cache_dir(), args),
            format!("kubectl {}", args.join(" ")),
        )
    }

    /// Applies example manifests of the repository's `examples/local`, in the order given.
    pub fn apply_examples(&self, files: &[&str]) {
        for file in files {
            self.kubectl_ok(&["apply", "-f", arg(&example(file))]);
        }
    }

    /// The phase of each machine (`kubectl get machines` with `args`, e.g. a label selector), one per machine.
    pub fn machine_phases(&self, args: &[&str]) -> Vec<String> {
        let mut command = vec!["get", "machines"];
        command.extend_from_slice(args);
        command.extend([
            "-o",
            "jsonpath={range .items[*]}{.status.currentStatus.phase}{\"\\n\"}{end}",
        ]);
        self.kubectl_ok(&command).lines().map(str::to_owned).collect()
    }

    /// Writes a file into the test's directory.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, text).expect("write a test file");
        path
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            eprintln!("server log of {}:\n{}", self.dir.display(), self.logs());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `kubectl --kubeconfig <kubeconfig> --cache-dir <cache_dir> <args>`.
pub fn kubectl_command(kubeconfig: &Path, cache_dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache_dir)
        .args(args);
    command
}

/// Runs kubectl to the end (panicking if it hangs past the command deadline); usable from other threads.
pub fn kubectl_at(kubeconfig: &Path, cache_dir: &Path, args: &[&str]) -> Output {
    Background::spawn(
        kubectl_command(kubeconfig, cache_dir, args),
        format!("kubectl {}", args.join(" ")),
    )
    .finish(COMMAND_DEADLINE)
}

/// An example manifest of the repository's `examples/local` (which must exist).
pub fn example(file: &str) -> PathBuf {
    mcm_testkit::example("local", file)
}

/// `mcm provider sim serve` on a unix socket in the test's directory, its simulated kubelets on `server`, once it
/// serves; `configure` adds flags or variables. Returns it and its endpoint (`unix://...`).
/// `mcm run` against `server` with the provider flags `provider` (`--provider sim`, or `--provider-endpoint E`) and
/// its metrics and probes on a free loopback port ([`address_of`] reads it); callers add their own flags.
pub fn mcm_run_command(server: &Server, provider: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
    command
        .args(["run", "--control-kubeconfig"])
        .arg(server.kubeconfig())
        .args(provider)
        .args(["--port", "0", "--address", "127.0.0.1"]);
    command
}

pub fn start_sim_provider(server: &Server, configure: impl FnOnce(&mut Command)) -> (Background, String) {
    let endpoint = format!("unix://{}", server.dir.join("provider.sock").display());
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
    command
        .args(["provider", "sim", "serve", "--target-kubeconfig"])
        .arg(server.kubeconfig())
        .env("MC_ENDPOINT", &endpoint);
    configure(&mut command);
    let provider = Background::spawn(command, "mcm provider sim serve".into());
    provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));
    (provider, endpoint)
}

/// A path as a `&str` argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// A plain HTTP/1.0 GET (no client library needed for two endpoints): status code and body.
pub fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect to mcm run");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status code");
    (status, body.to_owned())
}

/// The address of `/metrics` an `mcm run` or `mcm up` printed at start.
pub fn address_of(run: &Background) -> SocketAddr {
    let stdout = run.wait_for_stdout("the metrics address", |out| {
        out.contains("metrics and health on http://")
    });
    let rest = stdout
        .split("metrics and health on http://")
        .nth(1)
        .expect("the address line");
    rest.split_whitespace()
        .next()
        .and_then(|a| a.parse().ok())
        .expect("an address")
}
