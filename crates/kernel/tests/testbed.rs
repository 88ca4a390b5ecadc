//! The testbed on the real kernel: namespaces, a bridge and shaped veth links are made, carry
//! TCP between hosts, are reshaped, and are gone after the testbed is dropped — also when the
//! test panics with it up. Needs root (CAP_NET_ADMIN) and iproute2.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;

use pagewise_kernel::netns;
use pagewise_kernel::testbed::{profile, Testbed, TestbedSpec, TestbedState, HOST_DEVICE};

/// A testbed name of this test process (tests of several processes may run at once).
fn name(tag: char) -> String {
    format!("{tag}{}", std::process::id() % 10_000_000)
}

/// Echo one message from host `from` to a listener on host `to`.
fn echo_between(bed: &Testbed, from: usize, to: usize) -> Vec<u8> {
    let (to_host, to_addr) = (bed.host(to), bed.address(to));
    let listener = {
        let _inside = netns::enter(&to_host).unwrap();
        TcpListener::bind(format!("{to_addr}:0")).unwrap()
    };
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
    });
    let _inside = netns::enter(&bed.host(from)).unwrap();
    let mut c = TcpStream::connect((to_addr.as_str(), port)).unwrap();
    c.write_all(b"hello").unwrap();
    let mut back = vec![0u8; 5];
    c.read_exact(&mut back).unwrap();
    server.join().unwrap();
    back
}

#[test]
fn a_testbed_carries_tcp_between_hosts_is_reshaped_and_leaves_nothing() {
    let spec = TestbedSpec::new(name('k'), 3);
    let mut bed = Testbed::up(spec.clone(), profile("25gbe").unwrap()).unwrap();
    for i in 0..3 {
        assert!(netns::exists(&spec.host(i)));
    }
    assert!(netns::exists(&spec.switch()));
    let q = bed.link_qdiscs(1).unwrap();
    assert_eq!(q.matches("qdisc tbf").count(), 2, "both ends shaped:\n{q}");
    assert!(q.contains("rate 25Gbit"), "{q}");
    let state = TestbedState::load(&spec.name).unwrap().expect("state written");
    assert_eq!(state.profile, "25gbe");
    assert_eq!(state.hosts[2], (spec.host(2), "10.77.0.3".to_string()));
    assert_eq!(TestbedState::find_host(&spec.host(1)).unwrap().unwrap().1, 1);
    assert_eq!(echo_between(&bed, 0, 2), b"hello");

    // A host sees only its own link and loopback: no route leaves the testbed.
    let routes = std::process::Command::new("ip").args(["-n", &spec.host(0), "route"]).output().unwrap();
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert!(!routes.contains("default"), "{routes}");
    assert!(routes.contains(&format!("10.77.0.0/24 dev {HOST_DEVICE}")), "{routes}");

    bed.shape(profile("unshaped").unwrap()).unwrap();
    let q = bed.link_qdiscs(1).unwrap();
    assert!(!q.contains("tbf"), "{q}");
    assert_eq!(TestbedState::load(&spec.name).unwrap().unwrap().profile, "unshaped");
    assert_eq!(echo_between(&bed, 1, 0), b"hello");

    // A second testbed of the same name is refused, and the first stays whole.
    assert!(Testbed::up(spec.clone(), profile("unshaped").unwrap()).is_err());
    assert!(netns::exists(&spec.host(2)));

    let errors = bed.down();
    assert!(errors.is_empty(), "{errors:?}");
    for i in 0..3 {
        assert!(!netns::exists(&spec.host(i)), "{} left behind", spec.host(i));
    }
    assert!(!netns::exists(&spec.switch()));
    assert!(TestbedState::load(&spec.name).unwrap().is_none());
}

#[test]
fn a_panic_with_the_testbed_up_takes_it_down_and_ends_its_processes() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let spec = TestbedSpec::new(name('p'), 2);
    let s = spec.clone();
    let r = std::panic::catch_unwind(move || {
        let bed = Testbed::up(s, profile("myrinet-10g-x2").unwrap()).unwrap();
        let ns = netns::NetnsFile::open(&bed.host(1)).unwrap();
        let fd = ns.raw_fd();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("60");
        // SAFETY: setns is async-signal-safe.
        unsafe { cmd.pre_exec(move || netns::setns_net(fd)) };
        let child = cmd.spawn().unwrap();
        assert_eq!(netns::pids(&bed.host(1)).unwrap(), vec![child.id() as i32]);
        std::panic::panic_any(child);
    });
    let mut child = *r.unwrap_err().downcast::<std::process::Child>().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert!(!netns::exists(&spec.host(0)) && !netns::exists(&spec.host(1)) && !netns::exists(&spec.switch()));
    assert!(!Path::new(&format!("{}/{}.json", pagewise_kernel::testbed::STATE_DIR, spec.name)).exists());
}

#[test]
fn bad_specs_are_refused_before_anything_is_made() {
    let e = Testbed::up(
        TestbedSpec { subnet: [100, 64, 0], ..TestbedSpec::new(name('b'), 2) },
        profile("unshaped").unwrap(),
    );
    assert!(e.is_err());
    assert!(!netns::exists(&format!("{}-sw", name('b'))));
}
